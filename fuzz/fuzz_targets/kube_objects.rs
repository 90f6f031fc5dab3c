//! Kubernetes objects as the API server sends them (JSON), through their
//! serde types (k8s-openapi's Node and Pod, kube's DynamicObject for scale
//! targets) and lockstep's reduce functions, with the observation spec of
//! the default policy.

#[global_allocator]
static ALLOC: lockstep_fuzz::Bounded = lockstep_fuzz::Bounded::new();

use k8s_openapi::api::core::v1::{Node, Pod};
use lockstep_connectors::kube::reduce;

fn main() {
    let policy = lockstep_schemas::Policy::default();
    let spec = reduce::ObserveSpec::from_policy(&policy, &["topology.kubernetes.io/zone"]);
    let kind = reduce::ScaleKind::stateful_set();
    afl::fuzz!(|data: &[u8]| {
        if let Ok(node) = serde_json::from_slice::<Node>(data) {
            let _ = reduce::node(&node, &spec);
        }
        if let Ok(pod) = serde_json::from_slice::<Pod>(data) {
            let _ = reduce::pod(&pod, &spec);
        }
        if let Ok(obj) = serde_json::from_slice::<kube::core::DynamicObject>(data) {
            let _ = reduce::scale_ref(&obj, &kind);
            let _ = reduce::scale_target(&obj, &kind);
        }
    });
}
