"""What a run does around the step: checkpoints and exact resume (``checkpoints.py``, with the
checksums, the resume config check and the stop on signals), the Hugging Face export
(``export.py``), the run-folder lock, the console and ``train.log`` (``logging_setup.py``) and the
CSV logger that a resumed run continues (``csv_logger.py``)."""
