"""The HTTP front: the listener (listener.py), the route table
(routes.py) and the handlers by area, one module each (health.py, ...).
The check endpoints themselves run in fastlimit._http."""
