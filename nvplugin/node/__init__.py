"""What a node has and how it is wired (the model), and the runtime that reads it through NVML:
discovery once at start, health events after. The simulation (:mod:`nvplugin.sim`) and node files
(:mod:`nvplugin.nodefile`) sit above it; :mod:`nvplugin.nodesession` opens one or the other."""
