"""The evaluators of a costed program: the simpy engine (streams, flows, ledger, steady state, trace) and the critical-path evaluator."""
