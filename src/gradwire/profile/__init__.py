"""Profile the communication of a training job under a simulated network."""
from gradwire.profile.session import ProfileResult, ProfileSession, merge_traces, profile

__all__ = ["ProfileResult", "ProfileSession", "merge_traces", "profile"]
