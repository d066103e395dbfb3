"""The image side: per-target facts, Dockerfile rendering and the image build pipeline."""
