"""HTTP and WebSocket handlers, one module per family; they translate, the domain modules act."""
