//! Kubernetes watchers and actuator.
