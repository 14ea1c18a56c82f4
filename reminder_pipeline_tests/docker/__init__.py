"""Tests of the production deployment files under docker/ (no Docker engine needed)."""
