"""``zonemeter demo``: a three-zone lab cluster, one agent per node, live per-Service table.

See docs/demo.md. :mod:`tools.demo.topology` (the default cluster and traffic plan),
:mod:`tools.demo.cluster` (the lab as a cluster: hints, proxies, ground truth),
:mod:`tools.demo.agents` (running and scraping agents), :mod:`tools.demo.summary`
(agent numbers beside ground truth), :mod:`tools.demo.cli` (the verb).
"""
