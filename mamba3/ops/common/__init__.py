"""Kernels and host helpers shared by the SISO and MIMO Triton ops.

- :mod:`.chunking`      host-side chunk tables (dense and varlen; chunks never straddle sequences).
- :mod:`.cumsum`        per-chunk sums of decays and angle increments, the float64 cross-chunk angle prefix
                        (θ offsets, final angle state), and the angle backward (dφ, the dt part of the angle path).
- :mod:`.state_passing` the light pass that carries the (P×N, fp32) state across the chunks of each sequence,
                        forward (input state in, final state out) and reverse (dS).
- :mod:`.tiles`         @triton.jit helpers: per-chunk trapezoid scalars, θ tiles, sin/cos without libdevice,
                        adjacent-pair loads/stores (contiguous load, split into even/odd halves in registers).
- :mod:`.launch`        ``launch(kernel, grid, ...)`` and ``recording()``: every host launch goes through it so the
                        AOT lane can record the exact launches of a forward+backward on CPU tensors.
- :mod:`.replay`        ``gradients_only()``: the custom ops' backward replays a forward under autograd, and the
                        Triton ops' Functions then skip the kernel work their own backward recomputes.

Layout conventions shared by every kernel here: token-major inputs made contiguous by the host; batch strides are
derived inside the kernels as T × (per-model stride) with T marked ``do_not_specialize``, so a new B or T never
recompiles while vectorised loads stay provable; 1-D grids enumerate chunk-major with the head (and block) index
fastest, so concurrently running programs read neighbouring parts of the same DRAM rows of (B, T, H, ·) tensors.
"""
