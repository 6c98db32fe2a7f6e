"""Measurement probes: timings, profiles and checks that look inside the library on purpose.

Speed against the references, a round's profile, DP-SGD's chunk timing, the Adam row-work
count, the dead-unit measure of a collapsed MLP, the audits' power against the mechanisms,
the published code's timing and the "redesign changed no result" check. Unlike the grid and
table scripts one level up, they may import any room of ``fedem_private`` (the import-linter
contract "Benchmarks use the public API" exempts this package; benchmarks/README.md).
"""
