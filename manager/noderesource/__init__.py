"""Node resource calculation: batch and mid resources of a node, pure functions over Node,
NodeMetric and pod objects and the colocation strategy.

``inputs`` reads the objects into integer views, ``strategy`` resolves the node's colocation
strategy, ``batch`` and ``mid`` compute the formulas term by term, ``calculator`` ties them
together with degradation, CPU normalization and the update decision.
"""
