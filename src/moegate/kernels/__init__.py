"""Triton kernels: ``router`` (launcher, custom op, ``route_triton``) over ``router_kernel`` (the @triton.jit body)."""
