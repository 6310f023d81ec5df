"""What the koordlet, the manager and the scheduler share: Koordinator's API types and keys.

CRD models, label and annotation keys, QoS and priority classes and resource names, as Koordinator
defines them (``apis/`` at the root of its repository). Nothing here imports a binary's package.
"""
