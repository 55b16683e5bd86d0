"""The 2026 peers SAGA is measured against, one module each, modelled from their
papers' descriptions (each module says what it models, what it leaves out and which
constants it takes from the paper). They follow the simulator's policy contract
(`saga_server.engines.sim.policy`) and get the same tiers SAGA gets."""
