"""Simulation building blocks: GPU cost model (:mod:`jenga.sim.gpu`, :mod:`jenga.sim.model_cost`)
and request traces (:mod:`jenga.sim.workloads`, :mod:`jenga.sim.traces`).  Import the submodules
directly; nothing is re-exported here."""
