"""Named adapters: one ``dlm train`` of a multi-adapter document trains each adapter in turn.

* :mod:`.base_loan` - the base model, loaded once per invocation and lent to each adapter's run
* :mod:`.adapter_runs` - ``train_named``: each declared adapter as its own recorded train run
* :mod:`.gate_pass` - the learned gate fitted after the adapters (``training.gate``)
"""
