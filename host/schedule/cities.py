"""Coordinates (degrees latitude, longitude) of interconnection metros.

The table is the vocabulary of topology files: an island names a city from here, or
gives its own ``lat``/``lon``.  Includes the nine default hubs and the cities of the
published ping table used to validate the latency model (docs/schedule.md).
"""

__all__ = ["CITIES", "great_circle_m", "EARTH_RADIUS_M"]

import numpy as np

EARTH_RADIUS_M = 6_371_000.0

CITIES: dict[str, tuple[float, float]] = {
    # default hubs
    "Tokyo": (35.68, 139.69), "Singapore": (1.35, 103.82), "Hong Kong": (22.32, 114.17),
    "New York": (40.71, -74.01), "Chicago": (41.88, -87.63), "Los Angeles": (34.05, -118.24),
    "London": (51.51, -0.13), "Frankfurt": (50.11, 8.68), "Amsterdam": (52.37, 4.90),
    # other hubs a user may pick
    "Paris": (48.86, 2.35), "Marseille": (43.30, 5.37), "Stockholm": (59.33, 18.07),
    "Madrid": (40.42, -3.70), "Milan": (45.46, 9.19), "Zurich": (47.37, 8.54),
    "Moscow": (55.76, 37.62), "Dubai": (25.20, 55.27), "Mumbai": (19.08, 72.88),
    "Chennai": (13.08, 80.27), "Seoul": (37.57, 126.98), "Osaka": (34.69, 135.50),
    "Taipei": (25.03, 121.57), "Sydney": (-33.87, 151.21), "Brisbane": (-27.47, 153.03),
    "Ashburn": (39.04, -77.49), "Baltimore": (39.29, -76.61), "Dallas": (32.78, -96.80),
    "Miami": (25.76, -80.19), "Seattle": (47.61, -122.33), "Fremont": (37.55, -121.99),
    "San Jose": (37.34, -121.89), "Toronto": (43.65, -79.38), "Sao Paulo": (-23.55, -46.63),
    "Johannesburg": (-26.20, 28.05), "Jakarta": (-6.21, 106.85),
}


def great_circle_m(lat1, lon1, lat2, lon2):
    """Haversine distance in metres (numpy-broadcasting, degrees in)."""
    la1, lo1, la2, lo2 = (np.radians(np.asarray(x, float)) for x in (lat1, lon1, lat2, lon2))
    h = np.sin((la2 - la1) / 2) ** 2 + np.cos(la1) * np.cos(la2) * np.sin((lo2 - lo1) / 2) ** 2
    return 2 * EARTH_RADIUS_M * np.arcsin(np.sqrt(np.clip(h, 0.0, 1.0)))
