"""The NodeMetric controller: one NodeMetric per Node, carrying the collect policy.

See :mod:`manager.nodemetric.controller`.
"""
