"""Learning: the learners (DQN, PQN) behind one interface, their networks and fast
updates, what they learn from (environments, replay memory, rollouts), the actor and the
pipeline that runs acting and learning together, and the factory that builds them from a config.
"""
