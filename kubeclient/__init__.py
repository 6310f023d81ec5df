"""The Kubernetes client layer shared by the koordlet, koord-manager and koord-scheduler.

Configuration (in-cluster or kubeconfig), an HTTP/1.1 transport of its own, list-then-watch
informers, the API error tree and leader election live here, once, for all the binaries; no
generated client and no model classes (docs/kubernetes.md, "The client layer").
"""
