"""koord-scheduler: Koordinator's scheduling plugins as pure code over a cluster snapshot.

The plugins (``plugins/``, registered in the explicit table ``table.PLUGINS``) filter and score
nodes for a pod over a :class:`~scheduler_plugins.snapshot.Snapshot`; ``framework.py`` runs them
the way the kube-scheduler framework does (filter, score, normalize, weigh, reserve). Two front
ends use the same plugins: ``koord-scheduler explain`` (``cli.py``) and the kube-scheduler
extender (``extender.py``).
"""
