"""Engine children: argv from intents, launch, readiness, the stop ladder."""
