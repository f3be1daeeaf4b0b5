"""Once per model: the file read and bounded, its operators resolved, checked, functions inlined, initializers
untied, LoRA adapters added, and the graph converted (:func:`optkit.onnx._load.pipeline.load`)."""
