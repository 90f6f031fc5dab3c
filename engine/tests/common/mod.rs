//! Observations the engine's integration tests build many of.

use std::collections::BTreeMap;

use lockstep_schemas::{ConditionStatus, Connector, Event, KubeNode, KubePod, PodPhase};

/// A Ready Kubernetes node with these labels, cordoned or not.
pub fn kube_node(name: &str, unschedulable: bool, labels: BTreeMap<String, String>) -> KubeNode {
    KubeNode {
        read_labels: None,
        maintenance: None,
        name: name.into(),
        unschedulable,
        ready: ConditionStatus::True,
        conditions: vec![],
        labels,
        taints: vec![],
        identity: Default::default(),
        devices: Default::default(),
        version: 0,
    }
}

/// A Running, Ready slurmd pod in namespace `slurm` on `node`.
pub fn running_pod(name: &str, uid: &str, node: &str) -> KubePod {
    KubePod {
        namespace: "slurm".into(),
        name: name.into(),
        uid: uid.into(),
        node_name: Some(node.into()),
        phase: PodPhase::Running,
        deleting: false,
        disruption_target: false,
        labels: BTreeMap::new(),
        conditions: vec![],
        owner: None,
        revision: None,
        ready: true,
        unhealthy_devices: Default::default(),
        eviction: Default::default(),
        version: 0,
    }
}

/// Both connectors see their side.
pub fn both_visible() -> [Event; 2] {
    [Connector::Slurm, Connector::Kubernetes].map(|connector| Event::ConnectorStatus {
        connector,
        visible: true,
        detail: String::new(),
    })
}
