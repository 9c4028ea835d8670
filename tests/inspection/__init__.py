"""Tests of kvcompat.inspection: manifests, memory reports, transfer descriptors, CLI pieces."""
