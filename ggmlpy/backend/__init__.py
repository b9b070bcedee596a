"""The backend contract (ggml-backend.h / ggml-backend-impl.h): buffer types, buffers,
backends, devices, regs and events (:mod:`.interface`), generic buffers, tensor data
copies, write generations, the device registry and backend comparison.
"""
