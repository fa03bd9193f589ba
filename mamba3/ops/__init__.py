"""Mamba-3 operators: one folder per op (public function, autograd Function, launchers, kernels, configs)."""
