"""The seeded bugs: the corpus (`corpus.py`: the reference with exactly one real bug put back, one small
definition each) and the contract probes run beside each mutant's campaign (`contract_probes.py`: what a
fuzzed case cannot make happen).

Both are targets, below the oracles and the engine (DESIGN.md, "Layers"); the kill table that runs them
through the campaign stands above it, as `harness/kill_table.py`.
"""
