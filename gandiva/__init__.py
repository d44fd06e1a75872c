"""gandiva: a scheduler for deep-learning training jobs on shared GPU clusters.

After Xiao et al., "Gandiva: Introspective Cluster Scheduling for Deep Learning", OSDI 2018.
"""

__version__ = "0.1.0"
