"""The NodeSLO controller: ``slo-controller-config`` rendered into each node's NodeSLO.

:mod:`manager.slo.config` parses the keys and renders a node's spec; :mod:`manager.slo.controller`
keeps the NodeSLOs on the API server equal to it. Errors are :class:`apis.slo.SchemaError`
(configuration) and :class:`kubeclient.errors.ApiError` (the API server).
"""
