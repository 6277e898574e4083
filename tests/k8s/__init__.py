"""Tests against a real kube-apiserver and etcd (envtest.py): CRDs, the Kubernetes store."""
