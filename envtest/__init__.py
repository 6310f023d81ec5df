"""A real Kubernetes on this machine, for tests and benchmarks: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, containerd and a kubelet, each a process of ours on its
own ports, sockets, state folders, bridge and cgroup root, torn down in reverse order.

The binaries are the real ones (``../shared/k8s``, :mod:`envtest.assets`); etcd, containerd, runc
and the CNI plugins come from Debian's packages. controller-runtime's envtest names the same idea;
this one goes as far as a node. Nothing it starts sends a packet off the machine: the API server
and the kubelet serve on a bridge of ours, pods get routes to the pod and Service ranges only, the
kubelet resolves no name, images are imported, never pulled. See docs/realcluster.md.

Errors: every failure to bring a part up is :class:`~envtest.procs.StartError`, naming the part
and ending with its log's last lines.
"""
