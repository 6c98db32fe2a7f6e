"""Experiment plumbing: run directories, runner, recording, sweeps, results, reports, plots."""
