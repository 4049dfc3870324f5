"""One router per resource; all are mounted under /api/v1 by `server.app.create_app`."""
