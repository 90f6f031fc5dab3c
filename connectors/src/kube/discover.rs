//! Which version and resource name the API server serves a kind of scale
//! target under, from its discovery documents.
//!
//! A policy names a scale target by API group and kind only; the `apps/v1`
//! kinds need no asking, anything else (Slinky's NodeSet, any CRD with a
//! scale subresource) is looked up here by the observer before it watches
//! the kind and by the actuator before each scale. It only reads discovery;
//! it never caches, so a CRD installed or moved to a new version later is
//! seen at the next look-up.

use kube::Client;

use super::error::{Error, Result};
use super::spec::ScaleKind;

/// The name discovery gives the scale subresource of a resource.
const SCALE_SUBRESOURCE: &str = "scale";

/// `kind` with the version the API server prefers for its group and the
/// resource name it serves the kind under; `kind` itself when nothing is
/// to discover. Fails with [`Error::UnservedScaleKind`] when the group or
/// the kind is not served, or is served without a scale subresource.
pub async fn discover(client: &Client, kind: &ScaleKind) -> Result<ScaleKind> {
    if !kind.needs_discovery() {
        return Ok(kind.clone());
    }
    let unserved = |why| Error::UnservedScaleKind {
        group: kind.group.clone(),
        kind: kind.kind.clone(),
        why,
    };
    let group = match kube::discovery::group(client, &kind.group).await {
        Ok(g) => g,
        Err(kube::Error::Discovery(_)) => return Err(unserved(NOT_SERVED)),
        Err(e) => {
            return Err(Error::from_kube(
                format!("discover api group {:?}", kind.group),
                e,
            ))
        }
    };
    let (resource, capabilities) = group
        .recommended_kind(&kind.kind)
        .ok_or_else(|| unserved(NOT_SERVED))?;
    if !capabilities
        .subresources
        .iter()
        .any(|(sub, _)| sub.plural == SCALE_SUBRESOURCE)
    {
        return Err(unserved(NO_SCALE));
    }
    Ok(ScaleKind {
        version: resource.version,
        plural: resource.plural,
        ..kind.clone()
    })
}

/// Why a kind cannot be scaled: the API server does not serve it.
pub(super) const NOT_SERVED: &str = "is not served by the kubernetes api";
/// Why a kind cannot be scaled: it has no scale subresource.
pub(super) const NO_SCALE: &str = "has no scale subresource";
