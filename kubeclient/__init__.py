"""The Kubernetes client layer shared by the koordlet, koord-manager and koord-scheduler.

Built on kubernetes-asyncio: configuration (in-cluster or kubeconfig), list-then-watch
informers, the API error tree and leader election live here, once, for all three binaries.
"""
