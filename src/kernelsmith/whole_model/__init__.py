"""The whole-model stage: from a model and example inputs to a model that runs faster.

Read in pipeline order:

- :mod:`~kernelsmith.whole_model.profile`: time the model's forward, attribute it to op families
  and shapes, and write a ranked :class:`~kernelsmith.whole_model.profile.Plan`.
- :mod:`~kernelsmith.whole_model.optimize`: :func:`kernelsmith.optimize_model`, the front door:
  tune the plan's workloads in order, then keep each replacement only where the compiled model is
  faster in context.
- :mod:`~kernelsmith.whole_model.verify`: check the optimized model against the original on fresh
  inputs, and time both beside torch.compile.
- :mod:`~kernelsmith.whole_model.report`: tables and plots of what the database holds.

The single-op front doors (the decorator, the torch.compile backend, pattern recognition) live in
:mod:`kernelsmith.frontends`.
"""
