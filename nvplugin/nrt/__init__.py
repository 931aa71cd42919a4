"""What a node can still admit, per NUMA node, as a NodeResourceTopology object (the NRT API,
``topology.node.k8s.io/v1alpha2``): pure functions from the kubelet's pod resources answers and
nvplugin's own plan and topology to the object (``objects.py``), NFD's pod fingerprint
(``fingerprint.py``) and the best groups the free GPUs can still form (``bestgroups.py``). The
contract with the object's readers is docs/topology.md; the daemon publishes it through
:mod:`nvplugin.plugin.nrt`, ``nvplugin topology --simulate`` prints it."""
