"""The seeded bugs: the corpus (`corpus.py`: the reference with exactly one real bug put back, one small
definition each), the contract probes the kill table runs beside each campaign (`contract_probes.py`:
what a fuzzed case cannot make happen), and the kill table itself (`kill_table.py`: the clean reference
and every mutant through the same campaign).

The modules sit on different floors (DESIGN.md, "Layers"): the corpus and the probes below the oracles
and the engine, the kill table above the campaign. This module imports none of them.
"""
