"""The Horizon simulator itself: its HTTP face, its lake, a real SDK against it, conformance with
recorded Horizon."""
