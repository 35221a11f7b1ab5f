"""What a run trains on: the SFT examples, the token datasets, the preference columns, and the record of use.

* :mod:`.examples` - SFT examples as tensors straight from the token arrays
  and the datasets' memory maps, mixed by weight;
* :mod:`.inputs` - which token datasets a run trains on, checked before it does;
* :mod:`.preference_data` - cached preference tokens as the columns DPO and ORPO train on;
* :mod:`.usage` - what each rank trained on, recorded in store.db.
"""
