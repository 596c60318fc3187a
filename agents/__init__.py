"""LLM agents: observation text -> prompt -> generation -> parsed message and action.

This package turns text into text. It knows no scenario's rules: the scenario hands it an
observation and a system prompt, and gets back a completion that ``marl.protocols.markup`` parses.
"""
