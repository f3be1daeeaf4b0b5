"""Per node, at load: the plans the converter applies to each node through one hook
(:class:`optkit.onnx._plans.hook.GraphPlans`): the channels-last layout, ONNX Runtime's float16, the repeated
layers' keys."""
