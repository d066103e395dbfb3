"""The job side: job specs, the launch plan, launch, supervision, logs and run records."""
