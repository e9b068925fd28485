"""XLA profiles (XSpace) and HLO modules: reading and linking, for JAX on TPU and GPU."""
