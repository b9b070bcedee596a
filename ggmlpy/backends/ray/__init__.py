"""Remote devices as Ray actors: the runtime, the actor, graph specs and Ray settings.
"""
