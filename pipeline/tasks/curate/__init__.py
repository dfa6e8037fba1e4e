"""Curate: exact and near dedup and decontamination against benchmark fingerprint indexes
(KernelBench levels 1-4 ship in `data/`); `fingerprint` is what both sides compare."""
