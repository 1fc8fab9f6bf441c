"""The draft-training pipeline: regen → pretokenize → prepare → hsextract → train → convert → serve → bench."""
