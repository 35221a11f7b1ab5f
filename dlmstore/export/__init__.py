"""``dlm export``: a trained adapter leaves the store as files llama.cpp, Ollama and transformers load.

One module per noun:

* :mod:`~dlmstore.export.exporter`: ``dlm export`` itself, the steps in order;
* :mod:`~dlmstore.export.merge`: the merged model as a Hugging Face folder;
* :mod:`~dlmstore.export.architectures`: the architectures the GGUF writer knows
  (hyperparameters, the q/k permutation);
* :mod:`~dlmstore.export.vocab`: a tokenizer as GGUF metadata;
* :mod:`~dlmstore.export.model_gguf`: a model folder as one GGUF file (F16);
* :mod:`~dlmstore.export.adapter_gguf`: the adapter alone as a GGUF LoRA;
* :mod:`~dlmstore.export.quantize`: llama.cpp's quantiser, in a child process;
* :mod:`~dlmstore.export.runtime`: llama-cpp-python: found, run apart, asked for tokens;
* :mod:`~dlmstore.export.targets`: the Modelfile (its TEMPLATE translated from the
  chat template) and llama-server's command line;
* :mod:`~dlmstore.export.folder`: the export folder (whose it is), its manifest, publishing;
* :mod:`~dlmstore.export.record`: the ``exports`` rows and the lock's ``llama_cpp`` pin.

It sits above ``dlmstore.train`` (it reads adapter versions) and below
``dlmstore.prompt`` (which answers from an export); torch, transformers,
peft, gguf and llama_cpp are imported inside the functions that use them.
"""
