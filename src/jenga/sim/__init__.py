"""Simulation building blocks: GPU cost model (:mod:`jenga.sim.gpu`) and request traces
(:mod:`jenga.sim.workloads`).  Import the submodules directly; nothing is re-exported here."""
