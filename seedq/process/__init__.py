"""Process plumbing: exit statuses, child lifetimes, CPU pinning, memory limits,
JAX and gRPC process settings, whole-file writes. It imports nothing else of
seedq, so every part of seedq may use it."""
