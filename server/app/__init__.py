"""The application: the FastAPI app and its HTTP and websocket routes, readiness, and the process
(uvicorn, graceful drain, malloc and garbage-collection settings)."""
