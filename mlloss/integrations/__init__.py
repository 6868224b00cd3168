"""Integrations with training frameworks, one job per module; each imports only what it needs, and
nothing here is imported by ``import mlloss``:

* ``lightning.py`` -- :class:`RankingMetrics`, the Lightning callback that logs exact ranking
  metrics at validation (needs the ``lightning`` extra);
* ``lightning_checkpoints.py`` -- ``AtomicCheckpointIO`` (Lightning's checkpoint I/O through the
  atomic writes of :mod:`mlloss.checkpointing`) and the fault-test callback (``lightning``);
* ``torchrec.py`` -- ``TorchRecEmbedding``, ``ids_to_kjt``, ``shard_model``, ``dense_parameters``:
  TorchRec tables and their sharding, without Lightning (needs TorchRec, imported on first use);
* ``torchrec_strategy.py`` -- ``TorchRecStrategy``, Lightning's DDP for a module with sharded
  tables and their crash-safe checkpoint directories (needs both).

Which module needs which extra: ``mlloss._extras.MODULE_EXTRAS``. The losses, metrics, models
and data need none of them; the cross-device pairs of the losses are :mod:`mlloss.distributed`.
"""
