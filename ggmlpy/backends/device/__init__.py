"""The asynchronous device backend, generic over a runtime (streams, events, device
memory): SIM, CUDA and RAY devices are runtimes of it.
"""
