"""Hyper-parameter sweeps: a search space, trials that are ordinary jobs, and the early-stopping
rule that promotes or stops them from the values they report (``spec``, ``rules``). Pure: the
server runs a sweep (``gandiva.server.sweeps``), and so could the simulator.
"""
