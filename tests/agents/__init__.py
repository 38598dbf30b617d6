"""Agents the tests bring, as a user would: declared through ``durable_agents`` alone; no lab code names them."""
