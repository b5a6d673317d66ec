"""The transformers child: one process per resident model, run by the *engine's* interpreter.

It imports only the standard library, torch and transformers (sentence-transformers and
peft where the folder needs them): fitbox's own dependencies are not installed in the engine
environment, so nothing here may import ``fitbox``. It is started as a top-level package
(engines/tf.py puts the folder above it on ``sys.path``), so its imports are relative.
"""
